"""Hostile input: two interrupt causes (their analytics rollup columns); JSON columns that store any string exactly."""

import django.core.serializers.json
import streamrecover.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('streamrecover', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='analyticsrollup',
            name='cause_max_tokens_exceeded',
            field=models.BigIntegerField(default=0, verbose_name='cause max tokens exceeded'),
        ),
        migrations.AddField(
            model_name='analyticsrollup',
            name='cause_stream_deadline',
            field=models.BigIntegerField(default=0, verbose_name='cause stream deadline'),
        ),
        migrations.AlterField(
            model_name='attempt',
            name='request',
            field=streamrecover.fields.TextJSONField(blank=True, default=dict, encoder=django.core.serializers.json.DjangoJSONEncoder, help_text='As sent, secrets removed.', verbose_name='request'),
        ),
        migrations.AlterField(
            model_name='message',
            name='content',
            field=streamrecover.fields.TextJSONField(default=list, encoder=django.core.serializers.json.DjangoJSONEncoder, help_text='Canonical content blocks.', verbose_name='content'),
        ),
        migrations.AlterField(
            model_name='recoveryevent',
            name='payload',
            field=streamrecover.fields.TextJSONField(default=dict, encoder=django.core.serializers.json.DjangoJSONEncoder, verbose_name='payload'),
        ),
        migrations.AlterField(
            model_name='streamcheckpoint',
            name='data',
            field=streamrecover.fields.TextJSONField(encoder=django.core.serializers.json.DjangoJSONEncoder, verbose_name='data'),
        ),
        migrations.AlterField(
            model_name='thread',
            name='pending_notices',
            field=streamrecover.fields.TextJSONField(blank=True, default=list, encoder=django.core.serializers.json.DjangoJSONEncoder, verbose_name='pending notices'),
        ),
    ]
